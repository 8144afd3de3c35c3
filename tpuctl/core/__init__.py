"""What every side shares: the data model, the store and its layout, runs as the store records them,
local state and settings, the TPU catalog, errors. Imports nothing from cli/, control/ or host/."""

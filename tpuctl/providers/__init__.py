"""Where the compute lives. base.py is the contract every provider implements; registry.py gives the provider for
a name; stores.py opens a store from its URI (all the host uses); local.py and gcp/ are the providers;
agent_package.py builds the wheel remote hosts install."""

"""What your machine does to a cluster, with no user interface: the up/status/ls/down flows, submitting and
reading runs, following a run while its host comes and goes, downloading outputs."""

"""Where the compute lives. base.py is the contract every provider implements; registry.py gives the provider for
a name; stores.py opens a store from its URI (all the host uses); local.py, gcp/, gke/ and kaggle/ are the
providers, and google/ the Google plumbing gcp/ and gke/ share; agent_package.py builds the wheel remote hosts
install."""

"""The Google plumbing the Google Cloud and GKE providers share (gcp/ and gke/ both stand on it; it imports neither):
clients.py, the only place endpoints and credentials are applied; errors.py, Google's error payloads classified;
operations.py, waits and retries; project.py, which project; gcs_store.py, the store over a bucket (also on the
host: the agent's wheel carries it); storage.py, the cluster's bucket, and iam.py, its grants; permissions.py,
what the caller may do; vms.py, the plain Compute Engine VMs tpuctl makes, their operations and the project's
default service account."""

"""TPUs as Compute Engine resources (`up --api compute`, and always TPU7x): instances, and MIGs with a workload
policy (gce.py); the requests and names that takes (gce_requests.py); what Google says stands in the way
(gce_errors.py); reservations (gce_reservations.py); what `ls` finds of them (gce_inventory.py)."""

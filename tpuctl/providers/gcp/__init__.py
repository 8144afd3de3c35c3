"""The Google Cloud provider. Two paths to a TPU, each in its folder: tpuapi/, the Cloud TPU API (TPU VMs, legacy
TPU Nodes, queued resources); compute/, TPUs as Compute Engine resources (`up --api compute`: instances, MIGs with a
workload policy). Here, what both paths share: provider.py, planning.py, topology.py (which path makes the
compute), health.py, inventory.py, teardown.py, firewall.py, startup.py and watcher_vm.py. The Google plumbing
under them, shared with GKE, is ../google/."""

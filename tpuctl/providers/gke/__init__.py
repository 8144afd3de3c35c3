"""The GKE provider: TPU slices as GKE node pools, one run as one JobSet (issue 37)."""

"""What runs on the TPU host (or this machine for --provider local): the agent and everything it needs."""

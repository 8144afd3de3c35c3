"""`python -m tpuctl.agent --store URI --worker N --accelerator TYPE`: the host's entry point, the one the start-up
script's systemd unit and the local provider run. The agent itself lives in tpuctl/host/."""
from .host.agent import main

if __name__ == "__main__":
    main()

"""What every backend does the same way: the backend protocol, launches, logs, notices, mounts and
path confinement, the worker's environment and rank launcher, `hai exec`."""

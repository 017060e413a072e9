"""The local backend: each worker a process group on this machine, started by a spawner and watched
by a supervisor."""

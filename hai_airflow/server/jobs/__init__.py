"""The rules about jobs, users and nodes, read from and written to the store."""

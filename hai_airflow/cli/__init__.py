"""The `hai` command: submit, watch and steer training jobs from a shell."""

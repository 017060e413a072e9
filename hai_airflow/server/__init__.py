"""The control plane behind `hai serve`: store, REST API and controller loop."""

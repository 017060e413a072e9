"""The controller: the loop that plans, admits, stops and records, while this server holds the lease."""

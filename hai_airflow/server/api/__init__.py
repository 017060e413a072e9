"""The HTTP API: the FastAPI application, its routes, and the bulkheads that bound each user's share."""

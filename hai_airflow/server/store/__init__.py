"""The store: the database, its tables and migrations, the change feed and the controller lease."""

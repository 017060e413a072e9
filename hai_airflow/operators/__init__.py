"""Airflow operators that run hai jobs."""

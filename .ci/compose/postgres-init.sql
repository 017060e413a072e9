-- Runs once, when the PostgreSQL volume is created: the hai store's own database beside Airflow's.
CREATE USER hai WITH PASSWORD 'hai';
CREATE DATABASE hai OWNER hai;

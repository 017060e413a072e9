"""Airflow sensors for the hai platform."""

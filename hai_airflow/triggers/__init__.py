"""Airflow triggers for the hai platform."""

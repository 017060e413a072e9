"""Airflow hooks for the hai platform."""

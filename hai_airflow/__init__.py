"""hai-airflow: a managed GPU training platform with Apache Airflow as its front end."""

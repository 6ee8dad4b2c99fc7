//! Applies commands to the Airflow metadata database (issue 5). Nothing lives here yet.

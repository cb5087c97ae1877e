"""conveyor: a durable job queue for Python."""

"""Tensor graph -> kernels: where buffers are materialized, what fuses, in what order kernels run."""
from kiln.schedule.kernelize import Schedule, ScheduleItem, create_schedule  # noqa: F401

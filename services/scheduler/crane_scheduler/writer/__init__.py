"""The API writer: the scheduler's writes (binds, events, pod-status patches) sent by a child process
(``process``), fed over a pipe (``protocol``) by ``client.ApiWriter``."""

from crane_scheduler.writer.client import ApiWriter, ScheduledReport
from crane_scheduler.writer.protocol import Connection, Reply

__all__ = ["ApiWriter", "Connection", "Reply", "ScheduledReport"]

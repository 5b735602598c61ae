"""Laying models out over a worker group: per-part FSDP2 / replication, gradient sync, weight gathering."""

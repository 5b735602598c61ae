"""The single controller: resource pools, the Worker base, WorkerGroups and their dispatch modes."""

from mmrl.controller.dispatch import Dispatch, register
from mmrl.controller.resource_pool import ResourcePool
from mmrl.controller.worker import Worker
from mmrl.controller.worker_group import WorkerFailure, WorkerGroup

__all__ = ["Dispatch", "register", "ResourcePool", "Worker", "WorkerFailure", "WorkerGroup"]

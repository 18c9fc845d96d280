"""The runtime: the batch container and (later) workers and worker groups.

``core`` imports torch, numpy and Ray only; nothing above it.
"""

from hybridflow.core.data_proto import DataProto

__all__ = ["DataProto"]

"""Re-export of the vocabulary (it lives on the ground floor: ``capability_db.vocabulary``)."""
from __future__ import annotations

from capability_db.vocabulary import (DTYPE_NAMES, NAME_DTYPES, AttentionBatch, AttentionProblem, DeviceDesc,
                                      KVStorage, Layout, MaskKind, Phase, PosEncoding, Reason, Scale, dtype_name,
                                      class_middle, size_class)

__all__ = ["DTYPE_NAMES", "NAME_DTYPES", "AttentionBatch", "AttentionProblem", "DeviceDesc", "KVStorage", "Layout",
           "MaskKind", "Phase", "PosEncoding", "Reason", "Scale", "dtype_name",
           "class_middle", "size_class"]

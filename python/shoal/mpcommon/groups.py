"""The SageMaker library's names for its groups and rank kinds (both front ends).

MP is one model replica (pipeline x tensor parallel), PP a pipeline, TP the
ranks sharing tensor-parallel modules, DP every rank holding the same
partition, RDP the ranks holding the same piece of it (topology.py). Without
tensor parallelism MP and PP are the same ranks, and so are DP and RDP.
"""

import enum


class CommGroup(enum.Enum):
    WORLD = 0
    MP_GROUP = 1
    DP_GROUP = 2
    PP_GROUP = 3
    TP_GROUP = 4
    RDP_GROUP = 5


class RankType(enum.Enum):
    WORLD_RANK = 0
    MP_RANK = 1
    DP_RANK = 2
    PP_RANK = 3
    TP_RANK = 4
    RDP_RANK = 5


WORLD = CommGroup.WORLD
MP_GROUP = CommGroup.MP_GROUP
PP_GROUP = CommGroup.PP_GROUP
DP_GROUP = CommGroup.DP_GROUP
TP_GROUP = CommGroup.TP_GROUP
RDP_GROUP = CommGroup.RDP_GROUP

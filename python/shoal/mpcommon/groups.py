"""The SageMaker library's names for its groups and rank kinds (both front ends)."""

import enum


class CommGroup(enum.Enum):
    WORLD = 0
    MP_GROUP = 1
    PP_GROUP = 1
    DP_GROUP = 2


class RankType(enum.Enum):
    WORLD_RANK = 0
    MP_RANK = 1
    PP_RANK = 1
    DP_RANK = 2


WORLD = CommGroup.WORLD
MP_GROUP = CommGroup.MP_GROUP
PP_GROUP = CommGroup.PP_GROUP
DP_GROUP = CommGroup.DP_GROUP

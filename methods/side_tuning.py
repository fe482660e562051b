"""The side-tuning base class at the path plug-ins written before it moved import it from.

It is part of the method contract and lives in :mod:`petlprof.side_tuning` (exported as
``petlprof.SideTunedModel``), below the methods; import it from there.
"""

from petlprof.side_tuning import SideTunedModel, masked_mean

__all__ = ["SideTunedModel", "masked_mean"]

"""SageMaker data-parallel library (``smdistributed.dataparallel``), served by shoal."""

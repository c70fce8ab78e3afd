"""What the two model-parallel front ends share, free of any framework: the
configuration (config.py), the rank layout (topology.py), the pipeline
schedules (schedule.py) and the exceptions (errors.py).
shoal.modelparallel (PyTorch) and shoal.tensorflow.modelparallel (TensorFlow 2)
build on them."""

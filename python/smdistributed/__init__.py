"""SageMaker distributed training libraries' import paths, served by shoal."""

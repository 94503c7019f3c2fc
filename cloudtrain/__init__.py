"""cloudtrain: plan, launch, watch and always tear down distributed TensorFlow training jobs."""

__version__ = "0.1.0"

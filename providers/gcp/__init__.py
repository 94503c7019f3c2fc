"""The GCP provider (in progress): so far the GCS store (`storage`) and the error translation
(`errors`). `GcpProvider` and its Compute Engine side are not written yet, so the registry reports
the `gcp` provider as not available in this version."""

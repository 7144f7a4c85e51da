"""Image input: what a checkpoint says about its images (vision_spec), where a request's images come from
(image_source), how they become pixels and placeholder positions (image_prep, on the server's intake threads),
and the vision tower with its projector (vision_encoder, in the runner)."""

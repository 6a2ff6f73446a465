"""The gpunet diagnoser: names the bottleneck of a slowed training job."""

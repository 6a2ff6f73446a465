"""The gpunet diagnoser: names the bottleneck of a slowed training job."""

from gpunet.extras import DIAGNOSER_EXTRA, require

require("diagnoser", DIAGNOSER_EXTRA, "diagnose")

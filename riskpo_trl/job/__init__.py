"""The job layer: what a training run needs around whichever trainer it builds (start-up checks, stopping on a
signal, one run per output directory, the resumed schedule, the model card), above the trainers and below the
scripts."""

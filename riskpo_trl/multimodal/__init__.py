"""Multi-modal track: Geometry3K with vision-language models, and a tiny local VLM for tests."""

from ..rewards import geometry_accuracy_reward  # the math verifier under the track's name
from .geometry3k import GEOMETRY3K_ID, geometry3k_to_riskpo, load_geometry3k
from .tiny_vlm import build_tiny_vlm

__all__ = ["GEOMETRY3K_ID", "build_tiny_vlm", "geometry3k_to_riskpo", "geometry_accuracy_reward", "load_geometry3k"]

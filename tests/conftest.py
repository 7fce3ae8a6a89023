"""Suite-wide settings: property tests are judged on what they find, never on how fast a busy
machine runs them (Hypothesis's deadline and too-slow check are timings)."""
from hypothesis import HealthCheck, settings

settings.register_profile("swarm", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("swarm")

"""Suite-wide settings: property tests are judged on what they find, never on how fast a busy
machine runs them (Hypothesis's deadline and too-slow check are timings).

The README's command runs the suite in two pytest-xdist workers with `--dist loadfile`: each test file
goes to one worker whole, so its module fixtures are made once. (`loadgroup` would let files share a
worker, but pytest-xdist 3.8 cannot name groups under pytest 9: it sets a node id pytest 9 no longer reads.)"""
from hypothesis import HealthCheck, settings

settings.register_profile("swarm", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("swarm")

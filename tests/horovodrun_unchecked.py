"""`horovodrun` as the tests launch ranks: horovod's own command line (argument parsing,
rendezvous, Gloo launch, rank environment), less its per-launch check that horovod was built
with Gloo. That check imports TensorFlow in a throwaway process, about 6 s of a 2-core
machine per launch; the set-up builds horovod with Gloo required, so the answer is known.
Tests of horovodrun itself (README commands, signals to it) run the real binary."""
import sys

from horovod.runner import launch

if __name__ == "__main__":  # the launch spawns processes that re-import this file
    launch.gloo_built = lambda verbose=False: True
    sys.exit(launch.run_commandline())

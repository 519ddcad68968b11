"""hybridfl: hybrid federated learning.

Several clients each hold *some* samples and, for those, *some* feature blocks. Horizontal FL
(one block, different samples) and vertical FL (same samples, different blocks) are special cases.

Package layout (each folder names one part):

- ``hybridfl.data``        datasets with stable sample IDs and named feature blocks, loaders,
                           partitions, partitioners and coverage reports
- ``hybridfl.models``      feature extractors and classifiers (client and server shaped)
- ``hybridfl.matching``    Hungarian neuron matching of classifiers (PFNM cost)
- ``hybridfl.algorithms``  each algorithm as client-side and server-side steps exchanging messages,
                           built only by its ``AlgorithmSpec``
- ``hybridfl.runtime``     messages and their codec, transports, the round loop, the in-process
                           simulation and the Flower runtime
- ``hybridfl.reporting``   metrics, results files and plots
- ``hybridfl.cli``         the ``hybridfl`` command line
"""

from hybridfl.errors import HybridFLError

__version__ = "0.1.0"
__all__ = ["HybridFLError", "__version__"]

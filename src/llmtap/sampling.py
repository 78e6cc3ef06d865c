"""The public name of `llmtap.correlation.sampling`: `/ng-sampling/<segment>` values for model calls.

Agents and model servers import `llmtap.sampling`; the code lives with the rest of correlation.
Both names are one module object, so a context variable or a patched attribute is the same
whichever name reached it.
"""

import sys

from llmtap.correlation import sampling as _sampling

sys.modules[__name__] = _sampling

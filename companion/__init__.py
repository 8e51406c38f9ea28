"""companion: the tested PyTorch code behind *Transformers from the Ground Up*.

One module per concept; every chapter of the book imports its model code from here.
Submodules are imported explicitly (``from companion import recurrent``) so that importing the
package stays cheap.
"""

import warnings

__version__ = "0.1.0"

# Without ipywidgets, tqdm.auto falls back to text progress bars in notebooks (what the book
# wants) but first warns on stderr, which would differ between machines with and without it.
warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

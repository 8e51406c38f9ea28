"""companion: the tested PyTorch code behind *Transformers from the Ground Up*.

One module per concept; every chapter of the book imports its model code from here.
Submodules are imported explicitly (``from companion import recurrent``) so that importing the
package stays cheap, and importing it changes no global state (warning filters, threads, seeds).
"""

__version__ = "0.1.0"

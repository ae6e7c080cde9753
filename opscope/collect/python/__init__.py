"""The pure-Python collector, the fallback when the native observer can't be built.

``collector.PythonCollector`` times aten ops with a dispatch mode (``mode``), backward
nodes with autograd hooks (``backward``), higher-order ops (``hops``) and inputs
(``inputs``, encoded by ``input_encoding``) into per-thread rows (``rows``);
``recording`` holds one recording's state and patches; ``dynamo`` undoes what the mode
taught dynamo.
"""

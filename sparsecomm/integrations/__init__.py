"""Optional integrations of sparsecomm with training frameworks.

Each module here is imported only when its framework is installed (importing it without the
framework raises ImportError saying what to install), and the library core never imports them:
``import sparsecomm`` works, and behaves the same, with or without any framework.

* :mod:`sparsecomm.integrations.lightning`: PyTorch Lightning (``pip install 'lightning>=2.2,<3'``;
  in a checkout, ``pip install '.[lightning]'``).
* :mod:`sparsecomm.integrations.accelerate`: Hugging Face Accelerate (``pip install 'accelerate>=1.0'``;
  in a checkout, ``pip install '.[accelerate]'``).
"""

import sys

from examples.ray_serve.local import main

sys.exit(main())

import sys

from vla.serve import main

sys.exit(main())

import sys

from vla.bench import main

sys.exit(main())

import sys

from aiayn.cli.main import main

sys.exit(main())

import sys

from tests.soak.soak import main

sys.exit(main())

"""Panel data: observations, forward-backward inference, rate fitting, structural EM and the
panel CSV route."""

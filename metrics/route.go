package metrics

// Route is what the ingest did with a pgoutput message.
type Route uint8

const (
	// RoutePublish: the message produced events (insert, update, delete,
	// truncate, message in a published projection).
	RoutePublish Route = iota
	// RouteState: the message only updated the ingest's own state: relation,
	// type, begin, commit, origin, stream and two-phase framing.
	RouteState
	// RouteSkip: the message is not in any projection and was dropped.
	RouteSkip

	numRoutes = 3
)

// routeNames are the label values, indexed by Route.
var routeNames = [numRoutes]string{RoutePublish: "publish", RouteState: "state", RouteSkip: "skip"}

// routeOrder lists the routes sorted by name, the order Snapshot reports.
var routeOrder = [numRoutes]Route{RoutePublish, RouteSkip, RouteState}

// String returns the route's label value, or "invalid".
func (r Route) String() string {
	if r >= numRoutes {
		return "invalid"
	}
	return routeNames[r]
}
